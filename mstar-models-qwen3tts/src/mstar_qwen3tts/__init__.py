"""The ``qwen3tts`` model: Qwen3-TTS 12 Hz (CustomVoice, Base voice clone, VoiceDesign) as an M* plugin."""
