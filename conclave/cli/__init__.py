"""argv → a subcommand (commands/, one module each) or a Hydra-composed consultation (hydra_app,
task, panel). ``main.run`` is the console script."""
