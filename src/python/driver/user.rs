//! `user_await`: how the driver awaits user code (listeners, the model, serial hooks) so that
//! `cancel()` can throw `CancelledError` into it (SPEC 4.4).

use pyo3::intern;
use pyo3::prelude::*;

use super::delegate::await_iter;
use super::helpers::{exception, helpers, is_cancelled};
use super::step::StepBody;
use super::{dict, Body, Machine, Pending, Seam, UserStep};

impl Machine {
    /// `user_await(loop, awaitable)` at a seam of the turn loop.
    pub(super) fn user_await<'py>(&mut self, py: Python<'py>, awaitable: PyResult<Bound<'py, PyAny>>, seam: Seam) -> PyResult<Body<'py>> {
        match self.user_begin(py, awaitable, seam) {
            UserStep::Await(iter, pending) => Ok(Body::Await(iter, pending)),
            UserStep::Done(result) => self.seam_done(py, seam, result),
        }
    }

    /// `user_await(loop, awaitable)`: the flag `cancel()` reads, then the await. An error
    /// building the awaitable is the await's outcome.
    pub(super) fn user_begin<'py>(&mut self, py: Python<'py>, awaitable: PyResult<Bound<'py, PyAny>>, seam: Seam) -> UserStep<'py> {
        // The awaitable is built (and a waterfall's first listener called) before the flag.
        let awaitable = match awaitable {
            Ok(awaitable) => awaitable,
            Err(e) => return UserStep::Done(Err(e)),
        };
        if let Err(e) = self.agent(py).setattr(intern!(py, "_in_user"), true) {
            return UserStep::Done(Err(e));
        }
        match await_iter(awaitable) {
            Ok(iter) => UserStep::Await(iter, Pending::User(seam)),
            Err(e) => self.user_finish(py, Err(e), seam),
        }
    }

    pub(super) fn user_finish<'py>(&mut self, py: Python<'py>, outcome: PyResult<Bound<'py, PyAny>>, seam: Seam) -> UserStep<'py> {
        let outcome = outcome.map_err(|e| self.user_error(py, e));
        if let Err(e) = self.agent(py).setattr(intern!(py, "_in_user"), false) {
            return UserStep::Done(Err(e));
        }
        let result = match outcome {
            Ok(result) => result,
            Err(e) => return UserStep::Done(Err(e)),
        };
        let absorb = (|| -> PyResult<Option<Bound<'py, PyAny>>> {
            if !self.agent(py).getattr(intern!(py, "_thrown"))?.is_truthy()? {
                return Ok(None);
            }
            // The throw may still be pending (the code returned before awaiting): consume it.
            await_iter(helpers(py)?.sleep.bind(py).call1((0,))?).map(Some)
        })();
        match absorb {
            Ok(Some(sleep)) => UserStep::Await(sleep, Pending::Absorb { seam, result: result.unbind() }),
            Ok(None) => UserStep::Done(Ok(result)),
            Err(e) => UserStep::Done(Err(e)),
        }
    }

    /// What a `CancelledError` out of user code becomes: the abort we threw, a failure when no
    /// cancellation is in progress (SPEC 4.4), else itself (cancelled from outside).
    fn user_error(&self, py: Python<'_>, err: PyErr) -> PyErr {
        let transformed = (|| -> PyResult<Option<PyErr>> {
            let h = helpers(py)?;
            if !is_cancelled(py, h, &err) {
                return Ok(None);
            }
            let agent = self.agent(py);
            if agent.getattr(intern!(py, "_thrown"))?.is_truthy()? {
                h.uncancel.bind(py).call1((agent,))?;
                return Ok(Some(PyErr::from_value(h.aborted.bind(py).call0()?)));
            }
            if h.cancelling {
                let task = h.current_task.bind(py).call0()?;
                if !task.is_none() && !task.call_method0(intern!(py, "cancelling"))?.is_truthy()? {
                    let exc = &exception(py, &err);
                    let message = h.error_chain.bind(py).call1((exc,))?;
                    let code = "UNKNOWN".into_pyobject(py)?.into_any();
                    let failure = dict(py, &[("message", &message), ("code", &code)])?;
                    let turn_failure = h.turn_failure.bind(py).call1((failure, exc))?;
                    turn_failure.setattr(intern!(py, "__cause__"), exc)?;
                    return Ok(Some(PyErr::from_value(turn_failure)));
                }
            }
            Ok(None)
        })();
        match transformed {
            Ok(Some(e)) => e,
            Ok(None) => err,
            Err(e) => e,
        }
    }

    pub(super) fn absorb_finish<'py>(&mut self, py: Python<'py>, outcome: PyResult<Bound<'py, PyAny>>, result: Py<PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let h = helpers(py)?;
        if let Err(e) = outcome {
            if !is_cancelled(py, h, &e) {
                return Err(e);
            }
        }
        h.uncancel.bind(py).call1((self.agent(py),))?;
        Ok(result.into_bound(py))
    }

    /// A seam's `user_await` finished with `result`.
    pub(super) fn seam_done<'py>(&mut self, py: Python<'py>, seam: Seam, result: PyResult<Bound<'py, PyAny>>) -> PyResult<Body<'py>> {
        match seam {
            Seam::PreStep => self.after_pre_step(py, result?),
            Seam::Stopping => {
                result?;
                self.check(py)?;
                self.after_stopping(py)
            }
            _ => {
                let body = self.step_seam(py, seam, result);
                self.step_settle(py, body)
            }
        }
    }

    /// The step goes on inside its `try`, or ends (its `finally` appends `step/end`).
    pub(super) fn step_settle<'py>(&mut self, py: Python<'py>, body: PyResult<StepBody<'py>>) -> PyResult<Body<'py>> {
        match body {
            Ok(StepBody::Await(iter, pending)) => Ok(Body::Await(iter, pending)),
            Ok(StepBody::Done(end)) => self.step_done(py, Ok(end)),
            Err(e) => self.step_done(py, Err(e)),
        }
    }
}
