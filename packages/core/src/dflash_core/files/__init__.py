"""Files in and out: atomic writes, readable text/JSON inputs, manifests of converted artefacts.

Imports only `dflash_core.errors`; nothing here knows what a model is.
"""
