"""The pytest plugin's parts, one job each; :mod:`killpoint.plugin` is the module pytest loads.

Every module here imports only pytest and the standard library at load time.
"""
