-- The attributes that declare an agent's tool list (a condition on `a`, one of SpanAttributes'
-- key/value entries); analytics.code_actions.declared_tool_names reads the names out of a value.
--   gen_ai.tool.definitions         OpenTelemetry GenAI (ADK, Agent Framework, PydanticAI,
--                                   OpenLLMetry): a JSON list of {"type": "function", "name", ...}
--   gen_ai.agent.tools              Strands Agents: a JSON list of names
--   gen_ai.request.available_tools  a JSON list of names or definitions
--   llm.tools.<i>.tool.json_schema  OpenInference LLM spans (a tool-calling agent's model call):
--                                   {"type": "function", "function": {"name", ...}}
--   smolagents.tools_names          OpenInference smolagents agent spans (a CodeAgent's tools: its
--                                   model calls carry no llm.tools, the tools are in the prompt)
--   agent.tools                     OpenInference CrewAI agent spans: a JSON list of names
a.key IN ('gen_ai.tool.definitions', 'gen_ai.agent.tools', 'gen_ai.request.available_tools',
          'smolagents.tools_names', 'agent.tools')
OR (starts_with(a.key, 'llm.tools.') AND suffix(a.key, '.tool.json_schema'))
