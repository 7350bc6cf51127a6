"""mimo_ctx."""
