"""Schema and SchemaRegistry: subjects on a Confluent-compatible schema registry, declared as resources.

`spec` reads the resources (pure), `ccompat` is the registry's REST client, `reconcile` holds the ordered
steps that bring one subject in line with its Schema, `handlers` are kopf's entry points.
"""
