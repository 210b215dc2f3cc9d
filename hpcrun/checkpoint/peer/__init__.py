"""The peer tier of the checkpoint plane: partner copies and reads from other nodes (README.md)."""
