"""Framework adapters: one module per framework, each a built-in plugin."""
