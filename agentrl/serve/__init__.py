"""The policy behind an OpenAI-compatible endpoint, with every call recorded as tokens (issue 29).

* `agentrl.serve.protocol`: OpenAI request bodies in, typed requests out (or an OpenAI-style error); responses out.
* `agentrl.serve.engine_client`: one thread owns the `RequestEngine`; HTTP handler threads wait on futures.
* `agentrl.serve.sessions`: renders messages with the family's official template, keeps a session's sampled ids where
  the new prompt extends them, records every call and turns a session into training samples with its drift report.
* `agentrl.serve.server`: the HTTP server (``agentrl serve``): uvicorn behind `agentrl.http_guard`, on 127.0.0.1 by
  default, a bearer token to bind wider; its docstring says what a client can and cannot make it do.

Only the front end lives here. ``agentrl run --agent module:function`` (agent functions as the rollout) is a rollout
driver that uses these pieces: `agentrl.rollout.agents`.
"""
