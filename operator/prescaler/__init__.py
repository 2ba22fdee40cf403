"""prescaler: predictive pre-scaling of LLM inference fleets on Kubernetes."""

__version__ = "0.1.0"
