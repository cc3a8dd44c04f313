"""The leaf every layer may import: errors, paths, the caption grammar, weight storage and media file loaders.

Nothing here imports anything else of the project (tests/test_layers.py keeps it so)."""
