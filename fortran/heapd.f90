! heapd for Fortran: attach a heap, keep named persistent arrays in it as
! Fortran pointers, sync, detach. A module over heapd's C API
! (heapd/heapd.h) with iso_c_binding; arrays carry the record the C and
! Python APIs read (element type, shape, order), so an array made here is
! found there with the same type and shape, in Fortran order.
!
!   use heapd
!   type(heapd_heap) :: heap
!   real(real64), pointer :: u(:,:)
!   call heapd_attach(heap, "fields", create=.true.)
!   call heapd_array(heap, "u", u, [nx, ny])   ! creates (zero-filled) or finds
!   u(1, 1) = 1.0_real64
!   call heapd_sync(heap)                      ! a crash goes back to here
!   call heapd_detach(heap)
!
! heapd_array without `shape` finds an array of whatever shape it has (its
! rank and type must match). An array made in C order (by C or Python) is
! seen with its extents reversed: the same memory, read column-major.
!
! Errors: with `stat`, a nonzero errno value (heapd/heapd.h's table) and
! heapd_error() says why; without it, the message goes to stderr and the
! program stops (error stop).
!
! Build: gfortran -c heapd.f90 (installed as PREFIX/share/heapd/fortran/
! heapd.f90, and for gfortran compiled, with pkg-config heapd-fortran or
! CMake's heapd::heapd_fortran).
module heapd
  use, intrinsic :: iso_c_binding
  use, intrinsic :: iso_fortran_env, only: int32, int64, real32, real64, error_unit
  implicit none
  private

  public :: heapd_heap, heapd_attach, heapd_detach, heapd_sync, heapd_array, heapd_error
  public :: int32, int64, real32, real64

  ! An attached heap; default-initialized: not attached.
  type :: heapd_heap
    type(c_ptr) :: handle = c_null_ptr
  end type heapd_heap

  ! heapd_dtype of heapd/heapd.h.
  integer(c_int), parameter :: HEAPD_INT32 = 3, HEAPD_INT64 = 4, HEAPD_FLOAT32 = 9, &
                               HEAPD_FLOAT64 = 10
  integer, parameter :: MAX_RANK = 8

  ! heapd_attach_options and heapd_array_info of heapd/heapd.h.
  type, bind(C) :: attach_options
    integer(c_size_t) :: struct_size
    type(c_ptr) :: socket
    integer(c_int) :: create_if_missing
    integer(c_int) :: read_only
    integer(c_int64_t) :: max_size
    integer(c_int32_t) :: mode
    integer(c_int32_t) :: image  ! HEAPD_IMAGE_DEFAULT (0): heapd's choice
    type(c_ptr) :: storage       ! a C string; null: heapd's default tier
  end type attach_options

  type, bind(C) :: array_info
    integer(c_int) :: dtype
    integer(c_int) :: rank
    integer(c_int) :: fortran_order
    integer(c_int64_t) :: shape(MAX_RANK)
  end type array_info

  interface
    subroutine c_attach_options_init(options, size) bind(C, name="heapd_attach_options_init_sized")
      import :: attach_options, c_size_t
      type(attach_options), intent(out) :: options
      integer(c_size_t), value :: size
    end subroutine c_attach_options_init
    function c_attach(name, options) bind(C, name="heapd_attach") result(heap)
      import :: c_char, c_ptr, attach_options
      character(kind=c_char), intent(in) :: name(*)
      type(attach_options), intent(in) :: options
      type(c_ptr) :: heap
    end function c_attach
    function c_detach(heap) bind(C, name="heapd_detach") result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: heap
      integer(c_int) :: rc
    end function c_detach
    function c_sync(heap) bind(C, name="heapd_sync") result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: heap
      integer(c_int) :: rc
    end function c_sync
    function c_array(heap, name, info, create) bind(C, name="heapd_array") result(memory)
      import :: c_ptr, c_char, c_int, array_info
      type(c_ptr), value :: heap
      character(kind=c_char), intent(in) :: name(*)
      type(array_info), intent(in) :: info
      integer(c_int), value :: create
      type(c_ptr) :: memory
    end function c_array
    function c_find_array(heap, name, info) bind(C, name="heapd_find_array") result(memory)
      import :: c_ptr, c_char, array_info
      type(c_ptr), value :: heap
      character(kind=c_char), intent(in) :: name(*)
      type(array_info), intent(out) :: info
      type(c_ptr) :: memory
    end function c_find_array
    function c_last_error() bind(C, name="heapd_last_error") result(message)
      import :: c_ptr
      type(c_ptr) :: message
    end function c_last_error
    function c_errno() bind(C, name="__errno_location") result(location)
      import :: c_ptr
      type(c_ptr) :: location
    end function c_errno
    function c_strlen(text) bind(C, name="strlen") result(length)
      import :: c_ptr, c_size_t
      type(c_ptr), value :: text
      integer(c_size_t) :: length
    end function c_strlen
  end interface

  ! heapd_array(heap, name, array [, shape] [, stat]) for real32, real64,
  ! int32 and int64 arrays of rank 1 to 3.
  interface heapd_array
    module procedure &
      heapd_array_i4_1, &
      heapd_array_i4_2, &
      heapd_array_i4_3, &
      heapd_array_i8_1, &
      heapd_array_i8_2, &
      heapd_array_i8_3, &
      heapd_array_r4_1, &
      heapd_array_r4_2, &
      heapd_array_r4_3, &
      heapd_array_r8_1, &
      heapd_array_r8_2, &
      heapd_array_r8_3
  end interface heapd_array

contains

  ! What the last failed call of this thread said ("CODE: message").
  function heapd_error() result(message)
    character(:), allocatable :: message
    type(c_ptr) :: text
    character(kind=c_char), pointer :: chars(:)
    integer :: i, length
    text = c_last_error()
    length = int(c_strlen(text))
    allocate(character(length) :: message)
    if (length == 0) return
    call c_f_pointer(text, chars, [length])
    do i = 1, length
      message(i:i) = chars(i)
    end do
  end function heapd_error

  ! Attaches heap `name` (create: make it if missing; max_size in bytes and
  ! mode (permission bits, e.g. int(o'640')) and storage (the tier, as
  ! heapd's --storage names it), when creating; socket: heapd's, else
  ! $HEAPD_SOCKET or the default). Names and paths are trimmed of trailing
  ! blanks.
  subroutine heapd_attach(heap, name, create, read_only, max_size, mode, socket, stat, storage)
    type(heapd_heap), intent(out) :: heap
    character(*), intent(in) :: name
    logical, intent(in), optional :: create, read_only
    integer(int64), intent(in), optional :: max_size
    integer, intent(in), optional :: mode
    character(*), intent(in), optional :: socket, storage
    integer, intent(out), optional :: stat
    type(attach_options) :: options
    character(kind=c_char, len=:), allocatable, target :: socket_c, storage_c
    call c_attach_options_init(options, c_sizeof(options))
    if (present(create)) then
      if (create) options%create_if_missing = 1
    end if
    if (present(read_only)) then
      if (read_only) options%read_only = 1
    end if
    if (present(max_size)) options%max_size = max_size
    if (present(mode)) options%mode = int(mode, c_int32_t)
    if (present(socket)) then
      socket_c = trim(socket) // c_null_char
      options%socket = c_loc(socket_c)
    end if
    if (present(storage)) then
      storage_c = trim(storage) // c_null_char
      options%storage = c_loc(storage_c)
    end if
    heap%handle = c_attach(trim(name) // c_null_char, options)
    call check(c_associated(heap%handle), "heapd_attach", stat)
  end subroutine heapd_attach


  ! Syncs and ends the session; every pointer into the heap is invalid after.
  subroutine heapd_detach(heap, stat)
    type(heapd_heap), intent(inout) :: heap
    integer, intent(out), optional :: stat
    integer(c_int) :: rc
    rc = c_detach(heap%handle)
    heap%handle = c_null_ptr
    call check(rc == 0, "heapd_detach", stat)
  end subroutine heapd_detach

  ! Makes allocations, names and array contents persistent.
  subroutine heapd_sync(heap, stat)
    type(heapd_heap), intent(in) :: heap
    integer, intent(out), optional :: stat
    call check(c_sync(heap%handle) == 0, "heapd_sync", stat)
  end subroutine heapd_sync

  ! ok: the call succeeded. Else: stat set to errno, or stop with the message.
  subroutine check(ok, what, stat)
    logical, intent(in) :: ok
    character(*), intent(in) :: what
    integer, intent(out), optional :: stat
    integer(c_int), pointer :: error_number
    if (present(stat)) stat = 0
    if (ok) return
    if (present(stat)) then
      call c_f_pointer(c_errno(), error_number)
      stat = error_number
      if (stat == 0) stat = -1
      return
    end if
    write (error_unit, '(a)') what // ": " // heapd_error()
    error stop 1
  end subroutine check

  ! The memory of array `name` of `dtype` and `rank` and its Fortran
  ! extents: found (any shape, or `shape` if given), else made with `shape`.
  subroutine array_memory(heap, name, dtype, rank, memory, extents, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    integer(c_int), intent(in) :: dtype
    integer, intent(in) :: rank
    type(c_ptr), intent(out) :: memory
    integer(c_int64_t), intent(out) :: extents(rank)
    integer, intent(in), optional :: shape(:)
    integer, intent(out), optional :: stat
    type(array_info) :: info
    integer :: i
    logical :: same
    memory = c_find_array(heap%handle, trim(name) // c_null_char, info)
    if (c_associated(memory)) then
      do i = 1, rank
        if (info%fortran_order /= 0) then
          extents(i) = info%shape(i)
        else
          extents(i) = info%shape(rank + 1 - i)
        end if
      end do
      same = info%dtype == dtype .and. info%rank == rank
      if (same .and. present(shape)) same = all(extents == int(shape, c_int64_t))
      if (.not. same) memory = c_null_ptr
      call check_record(same, name, stat)
      return
    end if
    if (.not. present(shape)) then
      call check(.false., "heapd_array " // name, stat)
      return
    end if
    info%dtype = dtype
    info%rank = rank
    info%fortran_order = 1
    info%shape = 0
    info%shape(1:rank) = int(shape(1:rank), c_int64_t)
    extents = info%shape(1:rank)
    memory = c_array(heap%handle, trim(name) // c_null_char, info, 1_c_int)
    call check(c_associated(memory), "heapd_array " // name, stat)
  end subroutine array_memory

  ! An array found of another type, rank or shape: EPERM (1).
  subroutine check_record(ok, name, stat)
    logical, intent(in) :: ok
    character(*), intent(in) :: name
    integer, intent(out), optional :: stat
    if (present(stat)) stat = 0
    if (ok) return
    if (present(stat)) then
      stat = 1
      return
    end if
    write (error_unit, '(a)') "heapd_array " // name // &
      ": the heap holds an array of another type, rank or shape under this name"
    error stop 1
  end subroutine check_record

  subroutine heapd_array_i4_1(heap, name, array, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    integer(int32), pointer, intent(out) :: array(:)
    integer, intent(in), optional :: shape(1)
    integer, intent(out), optional :: stat
    type(c_ptr) :: memory
    integer(c_int64_t) :: extents(1)
    call array_memory(heap, name, HEAPD_INT32, 1, memory, extents, shape, stat)
    nullify(array)
    if (c_associated(memory)) call c_f_pointer(memory, array, extents)
  end subroutine heapd_array_i4_1
  subroutine heapd_array_i4_2(heap, name, array, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    integer(int32), pointer, intent(out) :: array(:,:)
    integer, intent(in), optional :: shape(2)
    integer, intent(out), optional :: stat
    type(c_ptr) :: memory
    integer(c_int64_t) :: extents(2)
    call array_memory(heap, name, HEAPD_INT32, 2, memory, extents, shape, stat)
    nullify(array)
    if (c_associated(memory)) call c_f_pointer(memory, array, extents)
  end subroutine heapd_array_i4_2
  subroutine heapd_array_i4_3(heap, name, array, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    integer(int32), pointer, intent(out) :: array(:,:,:)
    integer, intent(in), optional :: shape(3)
    integer, intent(out), optional :: stat
    type(c_ptr) :: memory
    integer(c_int64_t) :: extents(3)
    call array_memory(heap, name, HEAPD_INT32, 3, memory, extents, shape, stat)
    nullify(array)
    if (c_associated(memory)) call c_f_pointer(memory, array, extents)
  end subroutine heapd_array_i4_3
  subroutine heapd_array_i8_1(heap, name, array, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    integer(int64), pointer, intent(out) :: array(:)
    integer, intent(in), optional :: shape(1)
    integer, intent(out), optional :: stat
    type(c_ptr) :: memory
    integer(c_int64_t) :: extents(1)
    call array_memory(heap, name, HEAPD_INT64, 1, memory, extents, shape, stat)
    nullify(array)
    if (c_associated(memory)) call c_f_pointer(memory, array, extents)
  end subroutine heapd_array_i8_1
  subroutine heapd_array_i8_2(heap, name, array, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    integer(int64), pointer, intent(out) :: array(:,:)
    integer, intent(in), optional :: shape(2)
    integer, intent(out), optional :: stat
    type(c_ptr) :: memory
    integer(c_int64_t) :: extents(2)
    call array_memory(heap, name, HEAPD_INT64, 2, memory, extents, shape, stat)
    nullify(array)
    if (c_associated(memory)) call c_f_pointer(memory, array, extents)
  end subroutine heapd_array_i8_2
  subroutine heapd_array_i8_3(heap, name, array, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    integer(int64), pointer, intent(out) :: array(:,:,:)
    integer, intent(in), optional :: shape(3)
    integer, intent(out), optional :: stat
    type(c_ptr) :: memory
    integer(c_int64_t) :: extents(3)
    call array_memory(heap, name, HEAPD_INT64, 3, memory, extents, shape, stat)
    nullify(array)
    if (c_associated(memory)) call c_f_pointer(memory, array, extents)
  end subroutine heapd_array_i8_3
  subroutine heapd_array_r4_1(heap, name, array, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    real(real32), pointer, intent(out) :: array(:)
    integer, intent(in), optional :: shape(1)
    integer, intent(out), optional :: stat
    type(c_ptr) :: memory
    integer(c_int64_t) :: extents(1)
    call array_memory(heap, name, HEAPD_FLOAT32, 1, memory, extents, shape, stat)
    nullify(array)
    if (c_associated(memory)) call c_f_pointer(memory, array, extents)
  end subroutine heapd_array_r4_1
  subroutine heapd_array_r4_2(heap, name, array, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    real(real32), pointer, intent(out) :: array(:,:)
    integer, intent(in), optional :: shape(2)
    integer, intent(out), optional :: stat
    type(c_ptr) :: memory
    integer(c_int64_t) :: extents(2)
    call array_memory(heap, name, HEAPD_FLOAT32, 2, memory, extents, shape, stat)
    nullify(array)
    if (c_associated(memory)) call c_f_pointer(memory, array, extents)
  end subroutine heapd_array_r4_2
  subroutine heapd_array_r4_3(heap, name, array, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    real(real32), pointer, intent(out) :: array(:,:,:)
    integer, intent(in), optional :: shape(3)
    integer, intent(out), optional :: stat
    type(c_ptr) :: memory
    integer(c_int64_t) :: extents(3)
    call array_memory(heap, name, HEAPD_FLOAT32, 3, memory, extents, shape, stat)
    nullify(array)
    if (c_associated(memory)) call c_f_pointer(memory, array, extents)
  end subroutine heapd_array_r4_3
  subroutine heapd_array_r8_1(heap, name, array, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    real(real64), pointer, intent(out) :: array(:)
    integer, intent(in), optional :: shape(1)
    integer, intent(out), optional :: stat
    type(c_ptr) :: memory
    integer(c_int64_t) :: extents(1)
    call array_memory(heap, name, HEAPD_FLOAT64, 1, memory, extents, shape, stat)
    nullify(array)
    if (c_associated(memory)) call c_f_pointer(memory, array, extents)
  end subroutine heapd_array_r8_1
  subroutine heapd_array_r8_2(heap, name, array, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    real(real64), pointer, intent(out) :: array(:,:)
    integer, intent(in), optional :: shape(2)
    integer, intent(out), optional :: stat
    type(c_ptr) :: memory
    integer(c_int64_t) :: extents(2)
    call array_memory(heap, name, HEAPD_FLOAT64, 2, memory, extents, shape, stat)
    nullify(array)
    if (c_associated(memory)) call c_f_pointer(memory, array, extents)
  end subroutine heapd_array_r8_2
  subroutine heapd_array_r8_3(heap, name, array, shape, stat)
    type(heapd_heap), intent(in) :: heap
    character(*), intent(in) :: name
    real(real64), pointer, intent(out) :: array(:,:,:)
    integer, intent(in), optional :: shape(3)
    integer, intent(out), optional :: stat
    type(c_ptr) :: memory
    integer(c_int64_t) :: extents(3)
    call array_memory(heap, name, HEAPD_FLOAT64, 3, memory, extents, shape, stat)
    nullify(array)
    if (c_associated(memory)) call c_f_pointer(memory, array, extents)
  end subroutine heapd_array_r8_3

end module heapd
