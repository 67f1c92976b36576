"""The table's upkeep: ``table_maintenance`` and its schedule, ``forget``, and the coverage
checks of the column assets."""
