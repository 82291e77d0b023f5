"""What the tests share: fixtures' helpers, test handlers, the servers, the grants view."""
