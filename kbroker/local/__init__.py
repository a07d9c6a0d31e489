"""Run ZooKeeper and brokers as local processes (scripts/run and the test fixtures)."""
