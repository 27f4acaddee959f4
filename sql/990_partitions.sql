-- Monthly event partitions for this month and the next three, created on every migrate.
SELECT fabric.ensure_event_partitions(3);
-- Monthly measurement partitions for this month and the next three; points the default
-- partition holds move into their month's (fabric.ensure_measurement_partitions).
SELECT fabric.ensure_measurement_partitions(now(), 3);
