"""Experimental APIs kept where verl users import them from (`verl.experimental.*` -> `verl_like.experimental.*`)."""
