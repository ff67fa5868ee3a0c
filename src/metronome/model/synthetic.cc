// Placeholder: implemented in a follow-up commit.
