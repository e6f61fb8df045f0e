"""How rows become bytes: Examples (`examples`, `scatter`), blocks of rows (`blocks`), TFRecord frames."""
