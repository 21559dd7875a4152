"""How gnnflow talks to cloud services it does not run: bounded retries and the errors they end in."""
