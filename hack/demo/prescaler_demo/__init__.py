"""The live `make demo`: prescaler scaling a GPU Deployment ahead of a real trace."""
