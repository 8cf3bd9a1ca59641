"""plancache server: gRPC gateway, Redis store and job queue, GPU compile workers."""

__version__ = "0.1.0"
