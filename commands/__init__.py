"""The commands of ``cdbsim`` by group (study, planner, gpu); each module's ``register(app)`` adds its own."""
