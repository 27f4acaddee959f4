"""memfabric.langgraph's memory tools (LangMem's manage_memory / search_memory shape) driven by
`create_react_agent`: the model's tool calls become governed proposals, supersessions and
recalls of the user the graph's config names, never one the model names."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.prebuilt import create_react_agent

from conftest import Fabric
from memfabric.langgraph import create_manage_memory_tool, create_search_memory_tool
from memfabric.memory import Memory, MemoryConfig


def react_agent(model: Any, tools: list[Any]) -> Any:
    """`create_react_agent` as existing agent code calls it (LangGraph 1.x marks it as moved
    to langchain.agents; it still builds the same graph)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(model, tools)


class ScriptedChatModel(BaseChatModel):
    """A test double of a chat model: answers each turn with the next scripted message (a
    real model would choose the calls itself)."""

    script: list[AIMessage]

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.script.pop(0))])


def call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


def test_a_react_agent_writes_and_searches_memories_through_the_governed_path(
    fabric: Fabric,
) -> None:
    with Memory(MemoryConfig(database_url=fabric.url, broker=False)) as memory:
        tools = [create_manage_memory_tool(memory), create_search_memory_tool(memory)]
        schemas = {t.name: set(t.args) for t in tools}
        assert schemas == {  # only what the model knows: no user, tenant or run
            "manage_memory": {"content", "action", "id"},
            "search_memory": {"query", "limit"},
        }
        model = ScriptedChatModel(
            script=[
                call("manage_memory", {"content": "alice lives in Rotterdam"}, "c1"),
                call("search_memory", {"query": "Rotterdam"}, "c2"),
                AIMessage(content="You live in Rotterdam."),
            ]
        )
        agent = react_agent(model, tools)
        out = agent.invoke(
            {"messages": [("user", "remember that I live in Rotterdam")]},
            config={"configurable": {"user_id": "alice"}},
        )
        results = [m for m in out["messages"] if isinstance(m, ToolMessage)]
        assert results[0].content.startswith("created memory ")
        assert "alice lives in Rotterdam" in str(results[1].content)
        assert out["messages"][-1].content == "You live in Rotterdam."
        (stored,) = memory.get_all(user_id="alice")["results"]
        assert stored["memory"] == "alice lives in Rotterdam"
        assert stored["provenance"]["formed_by"] == "app-os-agt-010"
        assert memory.get_all(user_id="bob")["results"] == []


def test_manage_memory_updates_by_supersession(fabric: Fabric) -> None:
    with Memory(MemoryConfig(database_url=fabric.url, broker=False)) as memory:
        (old,) = memory.add("alice lives in Rotterdam", user_id="alice")["results"]
        tool = create_manage_memory_tool(memory)
        model = ScriptedChatModel(
            script=[
                call(
                    "manage_memory",
                    {"action": "update", "id": old["id"], "content": "alice lives in Utrecht"},
                    "c1",
                ),
                AIMessage(content="Noted."),
            ]
        )
        react_agent(model, [tool]).invoke(
            {"messages": [("user", "I moved to Utrecht")]},
            config={"configurable": {"user_id": "alice"}},
        )
        (now,) = memory.get_all(user_id="alice")["results"]
        assert now["memory"] == "alice lives in Utrecht" and now["supersedes"] == old["id"]
