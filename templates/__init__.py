"""Chat templates of real model families (Jinja files beside this module), installed as `agentrl.templates`."""
