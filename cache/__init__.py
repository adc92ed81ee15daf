"""The file-locked composition cache."""
