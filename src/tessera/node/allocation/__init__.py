"""Allocate: which container a call is for (matching), what is held (ledger), what the
container gets (allocator), and what gone containers leave (cleanup)."""
