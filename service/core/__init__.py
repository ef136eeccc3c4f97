"""App-wide pieces every resource uses: settings, the database and its models, errors and their one HTTP shape,
input checks at the API boundary, logs, metrics, and the request-level middleware (body limits, rate limits)."""
