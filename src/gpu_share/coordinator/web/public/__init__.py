"""The pages anyone may open, signed in or not: the landing page, signing in and out, the
provider's application with its private status link, and claiming an approved account."""
