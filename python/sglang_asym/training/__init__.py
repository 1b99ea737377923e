"""Training the reference model on CPU on text that ships with Python: corpus, loop, evaluation."""
