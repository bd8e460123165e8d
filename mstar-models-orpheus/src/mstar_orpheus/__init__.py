"""Orpheus TTS for M*: a Llama-3.2 backbone streaming SNAC codes into a 24 kHz decoder."""
