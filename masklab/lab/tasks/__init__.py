"""Task generators and data loaders."""
