"""agentrl's env package, installed as `agentrl.envs` (this top-level `envs/` folder): the env side in one place.

* `agentrl.envs.core`: the contract, `TextEnv` (Gymnasium's env with text observations and actions).
* `agentrl.envs.client_settings`: what a client of a served env may set (`ClientSetting`).
* `agentrl.envs.registry`: `register` / `make` / `registered`, by id, ``module:Class``, file path or URL.
* `agentrl.envs.remote`: a served env played as a `TextEnv` (``--env http://HOST:PORT/NAME``).
* `agentrl.envs.openenv`: OpenEnv both ways (an OpenEnv server played as a `TextEnv`; our envs answering OpenEnv).
* `agentrl.envs.server`: `agentrl env serve`, any registered env over HTTP and OpenEnv's WebSocket protocol.

The built-in envs are its subpackages (`math`, `alfworld`, `webshop`, `gui`, `code`), registered through the
``agentrl.envs`` entry points like any third-party env.
"""
