"""Routes used only by remote workers (claim, complete, fail)."""

urlpatterns: list = []
