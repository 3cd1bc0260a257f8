"""What one coordinator replica holds in memory: the container of its resources, the
work notifier, the live session hub and the verified-key cache."""
