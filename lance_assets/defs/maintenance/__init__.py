"""The table's upkeep: ``table_maintenance`` and its schedule, and the coverage checks of the
column assets."""
