"""The `hiercoll` command line. Each command lives in its own module exposing `register()`."""
