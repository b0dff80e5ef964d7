"""The commands of ``cdbsim`` by group (study, planner, gpu); each module's ``group.register(app)`` adds its own."""
