"""M* plugins for V-JEPA 2 (``vjepa2``) and V-JEPA 2-AC (``vjepa2ac``, alias ``vjepa2-ac``)."""
