"""``mstar.client``: a small SDK over the server's HTTP API (chat, speech, generate)."""

from mstar.client.client import Client, GenerateResult, MstarAPIError

__all__ = ["Client", "GenerateResult", "MstarAPIError"]
