"""Built-in procedural tasks small enough for a character-level model trained on CPU."""
