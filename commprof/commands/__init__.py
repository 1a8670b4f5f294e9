"""The command modules of the application layer: each parses its flags, checks which go
together, calls the model and prints (docs/design.md, "Layers")."""
