"""What every `dflash serve --engine E` shares, whatever the engine: nothing here imports an engine.

- `launch`: a server launch (command, environment, port), the engine's own environment and its probe,
  device and dtype choices, the target check;
- `drafters`: a drafter directory for the engine, converted by `dflash-convert --to E` into a cache
  keyed by content (inputs are never modified), or a converted one checked against its manifest;
- `supervise`: the server as a child process group: its log, /health, Ctrl-C forwarded, its death reported.

The engine plugins (dflash_sglang, dflash_vllm) supply what is engine-specific (the command line,
the probe script, the checks); this package sits between them and dflash_core, which never imports
engines, and is separate from either plugin so that neither imports the other.
"""
