"""The version of syncopate, in a module of its own: the environment fingerprint and the command
line read it, and a leaf imports nothing, so any package may."""

__version__ = "0.1.0"
