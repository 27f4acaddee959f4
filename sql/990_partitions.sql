-- Monthly event partitions for this month and the next three, created on every migrate.
SELECT fabric.ensure_event_partitions(3);
