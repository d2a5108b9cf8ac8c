"""Framework integrations: thin adapters that feed the core.

Each integration imports its framework only when it is used.
"""
