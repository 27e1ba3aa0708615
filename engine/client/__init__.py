"""The remote client SDK (gRPC); it imports no storage, writer or encoder module."""
from polyindex.client.remote import Client, RemoteCollection

__all__ = ["Client", "RemoteCollection"]
