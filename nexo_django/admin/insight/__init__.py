"""The approvals dashboard, suggested rules and the picture of a run, in the admin
(:mod:`.views`; charts drawn on the server, :mod:`.svg`)."""
