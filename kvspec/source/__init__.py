"""The YAML source format: load with positions, schema, expansion to layer specs."""
