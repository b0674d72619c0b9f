"""Shared machinery of the four storefront capability games in `games/` (not a game itself).

The games train skills for the built-in target benchmark `storefront`, so they keep its conversation
shape and only change what is asked:

- **Tools**: the storefront's full toolkit (`StorefrontTools`), so the tool list the model sees is the
  target's, byte for byte. An agent trained on the target calls tools a game has no use for (it looks the
  user's details up, say); offering only a game's subset turned those habits into unknown-tool errors and
  put a game out of reach of an agent that passes the same request in the target. A write the plan does
  not make changes the database, which every game's action part compares with the expected one.
- **System prompt**: the storefront's written policy (`benchmarks.storefront.policy.POLICY`), unchanged.
- **Conversation**: as in the target, the customer opens with a request but not who they are (unless the
  config sets `identity_in_opening`); the expert asks `AUTH_QUESTION`, looks the user up, and for each
  request makes its look-ups and write, then a statement that closes it. An episode holds one request, as
  the target's do (`requests_per_episode` > 1 brings further ones up one at a time through
  `Instance.follow_ups`: the customer's acknowledgement of a closed request brings the next, "Thanks. I also
  want to ..."); a game whose skill is keeping track of requests (`reveals_all_at_once`) puts them all in the
  opening instead.
- **Decision classes**: a game that declares `DECISION_CLASSES` says which one each request is in
  (`request_class`); the summary carries the episode's (`decision_class`), which skill each ablation would
  have needed on this instance (`skill_matters`: its writes leave another database than the oracle's) and the
  first mistake of an unsuccessful episode (`first_mistake`), for validate_game's class-prior rule and Step 2.
- **Ablations**: each game declares `ABLATIONS` (the expert without its skill, constant policies); a
  request's plan carries the ablated plans (`PlannedRequest.ablated`), `ablated_response(name)` plays
  them, and `ablation_probes` turns them into `GameSpec.ablations`, which validate_game holds to the
  largest decision class's share + pipeline.probes.PRIOR_MARGIN (ABLATION_LIMIT for a game without classes).
- **Customer**: the target's own scripted customer (`benchmarks.storefront.user_sim.UserSimulator`): the
  same question gets the same answer here and in the target ("which order do you mean?" gets the id).
  Its wording is seeded separately from the instance, so the instance stays the same.
- **Policy procedure**: as in the target (`benchmarks.storefront.compliance`), a write before
  authentication, a read before authentication, a write on an order not looked up, or a write with an id
  never seen voids the action part of the reward. Each planned write is preceded by a confirmation
  question (the policy asks for it), and a write without the customer's yes right before it breaks the
  policy, as in the target (unless a surface's policy has no such rule: then the expert does not ask).
- **Telling**: replies are judged with the target's rules (`benchmarks.storefront.communication`): a
  value counts only in an honest reply (no pasted tool output, no list of copied values, no amount,
  status or order id outside the instance's legitimate ones).
- **Expected state**: an `Instance` carries the oracle's plan. Its write calls, applied with the same
  tools to a copy of the starting database, give the database the episode must end with; rewards
  compare against that copy rather than re-implementing the tools.
- **Oracle**: `oracle_response()` follows the plan from the current state (ask, authenticate, then the
  current request's first call not yet made successfully, with a confirmation question before a write,
  then its statement), as Hermes markup made by `train.chat_template.render_tool_call` or as plain text.
- **Surface** (`StorefrontGameConfig.storefront`): the target's `StorefrontConfig`, as a storefront YAML
  (`configs/storefront/cpu_demo.yaml`) or a mapping of its fields (with an optional `file` key naming the
  YAML they override). With it, a game draws its tasks the target's way: the store and customer with
  `benchmarks.storefront.tasks.draw_customer` and each request with the target's own `RequestBuilder`, so
  the openings, id forms (loose and unknown ids, with the order search), reason phrasings, item counts,
  payment-method mix, confirmation questions and plans are the target's; the request kinds are the
  target's kinds where the game's capability applies, at the target's relative weights
  (`surface_kind_weights`). A game's own knob then sets the capability's need on top of that surface. When
  the surface asks for confirmation, a write without the customer's yes right before it breaks the policy
  here too; when it does not, the expert does not ask and the system prompt is the target's policy without
  the rule. The config field holds the resolved surface (every StorefrontConfig field, JSON-ready), so it
  is saved with any result that saves the game's config. Without a surface (None, the default) each game
  keeps its own defaults, described in its module docstring (the game run alone).

A game subclasses `StorefrontCapabilityGame` and implements `_build_alone(rng)` (its own instance) and
`_draw_from_surface(rng)` (one drawn from the target's surface; `build_instance` picks between them, and
all randomness comes from that `random.Random(seed)`) and `score()` (named reward parts that add up to the
reward; `request_done`, `request_reported`, `nothing_else_changed` and `mean_parts` score per request).
"""
