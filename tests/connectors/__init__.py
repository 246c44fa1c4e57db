"""Support for the connector tests: hand-built caches and peer processes."""
