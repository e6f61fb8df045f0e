"""The blocks layout at run time: parsing, the streaming and seekable orders, canonical partitions, column cache."""
