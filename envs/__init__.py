"""agentrl's built-in environments, installed as `agentrl.envs.<name>` and registered through entry points."""
