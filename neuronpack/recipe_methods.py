"""What a recipe answers from its fields, for the validated ``Recipe`` (pydantic, ``recipe.py``) and the memo's
``RecipeView`` (``recipe_memo.py``) alike: one implementation, no pydantic.

Example::

    recipe.max_context_length     # target.max_context_length, else target.seq_len
    recipe.bucket_plan()          # the buckets this recipe compiles
    recipe.instance_for("torch")  # "cpu" unless target.instance says otherwise
"""

from __future__ import annotations

from neuronpack.buckets import BucketPlan, plan_buckets


class RecipeMethods:
    """Mixed into ``Recipe`` and ``RecipeView``: reads ``target`` and ``buckets`` only."""

    @property
    def max_context_length(self) -> int:
        return self.target.max_context_length or self.target.seq_len

    def bucket_plan(self) -> BucketPlan:
        """The bucket plan this recipe compiles (NxDI's auto formula unless lists are given)."""
        return plan_buckets(
            self.target.seq_len,
            self.max_context_length,
            enabled=self.buckets.enabled,
            context=self.buckets.context,
            token_generation=self.buckets.token_generation,
        )

    def instance_for(self, framework: str) -> str:
        """The instance actually targeted once the framework is known."""
        if self.target.instance:
            return self.target.instance
        return {"torch": "cpu", "vneuron": "trn2"}.get(framework, "trn1")
