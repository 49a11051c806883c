"""Data preparation (prepare.py) and tokenizers (tokenizer.py) for nanorope."""
