"""The ``qwen3tts`` model: Qwen3-TTS 12 Hz CustomVoice as an M* plugin."""
