"""What a training run read (``read.json``): the trainer writes it, ``forget`` and ``explain`` read
it. The record's format lives in the table layer (``lance_assets.table.read_record``) so the
table's own ``forget`` reads it without importing the trainer."""

from lance_assets.table.read_record import FORMAT, RECORD, load, rows_read, write

__all__ = ["FORMAT", "RECORD", "load", "rows_read", "write"]
